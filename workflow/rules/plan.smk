# The plan (streamback/plan.py): before any job, every job kind of the config, what it asks Slurm
# for against what it needs on each GPU of plan.gpu_memory_gb (host and GPU memory, runtime in
# walltime slices, the matrix's disk, GPU-hours against train.budget_gpu_hours), and one line per
# mismatch to fix. `snakemake plan` (a local rule: seconds, no model); `-R plan` writes it again.
# Output (streamback/layout.py): results/tables/plan.csv.


localrules:
    plan,


rule plan:
    output:
        table=str(layout.table(layout.PLAN_TABLE)),
    conda:
        "../../envs/analysis.yaml"
    log:
        "logs/plan.log",
    threads: 1
    resources:
        mem_mb=2000,
        runtime=10,
    params:
        config=as_json(config),
    shell:
        "streamback plan --config-json {params.config} --out {output.table:q} > {log:q} 2>&1 || log_tail {log:q}; cat {log:q} >&2"

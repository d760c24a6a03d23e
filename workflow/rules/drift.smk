# Drift of a long running sum kept in a narrow float format (the drift note).
# One job: the simulation is vectorised and takes seconds, so it is not split per setting.
# Outputs: results/drift/ (streamback/layout.py: DRIFT_FILES, and DRIFT_FIGURES as .svg and .png).


rule drift:
    output:
        summary=report(drift_file("summary"), caption="../report/drift_summary.rst", category="Drift"),
        trajectories=drift_file("trajectories"),
        spacing=report(drift_file("spacing"), caption="../report/drift_spacing_table.rst", category="Drift"),
        ratio_svg=report(drift_file("drift_ratio", "svg"), caption="../report/drift_ratio.rst", category="Drift"),
        ratio_png=drift_file("drift_ratio", "png"),
        trajectories_svg=report(drift_file("trajectories", "svg"), caption="../report/drift_trajectories.rst", category="Drift"),
        trajectories_png=drift_file("trajectories", "png"),
        spacing_svg=report(drift_file("spacing", "svg"), caption="../report/drift_spacing.rst", category="Drift"),
        spacing_png=drift_file("spacing", "png"),
        html=report(drift_file("report"), caption="../report/drift_report.rst", category="Drift"),
    conda:
        "../../envs/drift.yaml"
    log:
        "logs/drift.log",
    benchmark:
        str(layout.timing_file("drift")),
    threads: 1
    resources:
        mem_mb=2000,
        runtime=30,
    params:
        drift=as_json(jobs.drift(config)["drift"]),
        outdir=lambda wildcards, output: Path(output.summary).parent,
    shell:
        "OMP_NUM_THREADS={threads} streamback drift --params {params.drift} --outdir {params.outdir:q} > {log:q} 2>&1 || log_tail {log:q}"


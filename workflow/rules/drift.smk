# Drift of a long running sum kept in a narrow float format (second seed document).
# One job: the simulation is vectorised and takes seconds, so it is not split per setting.

DRIFT = "results/drift"


rule drift:
    output:
        summary=report(f"{DRIFT}/summary.csv", caption="../report/drift_summary.rst", category="Drift"),
        trajectories=f"{DRIFT}/trajectories.parquet",
        spacing=report(f"{DRIFT}/spacing.csv", caption="../report/drift_spacing_table.rst", category="Drift"),
        ratio_svg=report(f"{DRIFT}/drift_ratio.svg", caption="../report/drift_ratio.rst", category="Drift"),
        ratio_png=f"{DRIFT}/drift_ratio.png",
        trajectories_svg=report(f"{DRIFT}/trajectories.svg", caption="../report/drift_trajectories.rst", category="Drift"),
        trajectories_png=f"{DRIFT}/trajectories.png",
        spacing_svg=report(f"{DRIFT}/spacing.svg", caption="../report/drift_spacing.rst", category="Drift"),
        spacing_png=f"{DRIFT}/spacing.png",
        html=report(f"{DRIFT}/report.html", caption="../report/drift_report.rst", category="Drift"),
    conda:
        "../../envs/drift.yaml"
    log:
        "logs/drift.log",
    threads: 1
    resources:
        mem_mb=2000,
        runtime=30,
    params:
        cfg=params_json("drift"),
    shell:
        "OMP_NUM_THREADS={threads} {STREAMBACK} drift --params {params.cfg} --outdir {DRIFT} > {log} 2>&1"


TARGETS.extend(rules.drift.output)

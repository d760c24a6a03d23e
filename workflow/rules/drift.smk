# Drift of a long running sum kept in a narrow float format (second seed document).
# One job: the simulation is vectorised and takes seconds, so it is not split per setting.
# Outputs: results/drift/ (streamback/layout.py: DRIFT_FILES, and DRIFT_FIGURES as .svg and .png).

from streamback import layout

DRIFT = layout.DRIFT_DIR


def drift_out(name, suffix=None):
    return str(DRIFT / (f"{name}.{suffix}" if suffix else layout.DRIFT_FILES[name]))


rule drift:
    output:
        summary=report(drift_out("summary"), caption="../report/drift_summary.rst", category="Drift"),
        trajectories=drift_out("trajectories"),
        spacing=report(drift_out("spacing"), caption="../report/drift_spacing_table.rst", category="Drift"),
        ratio_svg=report(drift_out("drift_ratio", "svg"), caption="../report/drift_ratio.rst", category="Drift"),
        ratio_png=drift_out("drift_ratio", "png"),
        trajectories_svg=report(drift_out("trajectories", "svg"), caption="../report/drift_trajectories.rst", category="Drift"),
        trajectories_png=drift_out("trajectories", "png"),
        spacing_svg=report(drift_out("spacing", "svg"), caption="../report/drift_spacing.rst", category="Drift"),
        spacing_png=drift_out("spacing", "png"),
        html=report(drift_out("report"), caption="../report/drift_report.rst", category="Drift"),
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
        cfg=params_json("drift"),
    shell:
        "OMP_NUM_THREADS={threads} {STREAMBACK} drift --params {params.cfg} --outdir {DRIFT} > {log} 2>&1"


TARGETS.extend(rules.drift.output)

# The study page (streamback/report/): results/study.html from everything the other stages make
# (TARGETS, filled by the rule files included before this one) and the merged config.

from pathlib import Path

from streamback import layout

CONFIG_FILES = [str(DEFAULT_CONFIG), *(str(Path(f).resolve()) for f in workflow.overwrite_configfiles)]


rule study_report:
    input:
        list(TARGETS),
    output:
        report(str(layout.STUDY_PAGE), caption="../report/study_report.rst", category="0. Start here"),
    conda:
        "../../envs/analysis.yaml"
    log:
        "logs/study_report.log",
    benchmark:
        str(layout.timing_file("study_report")),
    threads: 1
    resources:
        mem_mb=2000,
        runtime=10,
    params:
        config=as_json(config),
        files=shell_words(CONFIG_FILES),
    shell:
        "streamback study-report --config-json {params.config} --config-files {params.files} --out {output:q} > {log:q} 2>&1 || log_tail {log:q}"


TARGETS.append(rules.study_report.output[0])

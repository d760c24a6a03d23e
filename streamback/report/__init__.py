"""The study page (`results/study.html`): what was run, the answer in words, and every stage's tables and figures, in
one self-contained page."""

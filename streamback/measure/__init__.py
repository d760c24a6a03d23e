"""Measurement of a training step: its definition, its speed (`streamback bench`) and its memory
(`streamback memory`)."""

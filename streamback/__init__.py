"""streamback: residual-stream precision in Llama 3 training (bf16 vs fp32 streams and below)."""

__version__ = "0.1.0"

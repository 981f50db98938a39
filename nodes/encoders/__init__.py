"""Text encoders, their tokenizers and CLIP vision (plain PyTorch; data/ holds the CLIP BPE vocabulary)."""

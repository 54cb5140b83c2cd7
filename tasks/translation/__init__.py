"""Machine translation with an encoder-decoder transformer: wmt14-en-de, wmt14-en-fr.

Follows CAPE: Likhomanenko et al., "CAPE: Encoding Relative Positions with Continuous
Augmented Positional Embeddings", NeurIPS 2021 (Section 5.3, Appendix D, Figure 8).

The tasks are declared in ``configs/tasks/<name>.yaml`` (``implementation:``) and imported
on first use."""

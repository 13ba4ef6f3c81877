"""HBM estimate for HLO that has no buffer assignment (HLO text, CPU/GPU/TF dumps).

Placeholder until the text path lands."""

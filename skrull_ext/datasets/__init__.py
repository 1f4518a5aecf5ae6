"""Data for skrull-ext runs: shipped length distributions, a synthetic token
source that follows them, and the dataloaders that feed torchtitan."""

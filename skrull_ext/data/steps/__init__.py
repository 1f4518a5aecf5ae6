"""How steps are built from the sources: the dataloaders (Skrull's scheduling loader, torchtitan's
packed rows), look-ahead windows and their width, the length limit and its counts, the per-rank
buffers, and the prefetch thread."""

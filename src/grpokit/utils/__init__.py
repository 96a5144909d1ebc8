"""Small helpers with no grpokit imports above them: optional imports, UTF-8 text, file modes,
dtypes, memory release, output folders, and ``torch.distributed`` ranks."""

"""Architecture learning: DARTS's searchable and fixed networks and their genotypes."""

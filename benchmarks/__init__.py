"""tensorsql benchmarks: ``python -m benchmarks`` runs every section and prints one table (see __main__)."""

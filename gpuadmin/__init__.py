"""gpuadmin: a web admin panel for labs that share GPU servers."""

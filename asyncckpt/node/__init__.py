"""This process's place in the job: launcher variables, topology (ranks per node, thread
budget), rank identity and collectives over MPI or torch.distributed."""

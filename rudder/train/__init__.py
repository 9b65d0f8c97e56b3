"""Training: the run config, the model, data-parallel gradients, evaluation, checkpoint
coordination, the trainer and the job's start-up."""

"""The worker process: boot, the serving loop and its rooms (intake, answers, the model set,
lanes, the background batch), the zygote that forks it, and the batcher."""

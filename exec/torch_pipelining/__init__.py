"""torch.distributed.pipelining side by side: its schedule orders read into our IR (`orders`), our schedules run on its runtime (`runtime`), and the activations its runtime holds (`memory`)."""

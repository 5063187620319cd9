"""torch.distributed.pipelining side by side: its schedule orders read into our IR (`orders`), and our schedules run on its runtime (`runtime`)."""

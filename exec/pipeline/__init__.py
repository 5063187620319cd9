"""A whole pipelined run: its configuration (`config`), what each rank runs (`worker`) and the parent that starts, checks and gathers them (`runner`)."""

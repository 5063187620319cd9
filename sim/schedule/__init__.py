"""The schedule IR: actions and their kinds, the liveness of activations they imply, and the generators that write a schedule per device."""

"""The schedule IR: actions and their kinds, and the generators that write a schedule per device."""

"""What every capability shares to be observed: causes of events, and trace spans."""

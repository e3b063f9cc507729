"""What the benchmarks share: the machine's name, a trainer stand-in, counting collectives."""

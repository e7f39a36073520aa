"""Node-side programs: collectors, the publisher, executors, the simulated fleet."""

"""The parts of the reliability bench (`python -m bench.reliability_bench`): request migration after
a worker is killed, a soak of many concurrent streams, and Redis restarts under load. Each part
starts its own private Redis and stack and returns a plain dict for the JSON."""

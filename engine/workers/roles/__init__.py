"""The roles of the tuning guide as worker classes (one instance per GPU / CPU slot): what a worker is."""

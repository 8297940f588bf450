// Small progressive enhancements; every page works without them.

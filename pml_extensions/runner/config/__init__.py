"""Where a config key is parsed: files, powerful-benchmarker syntax, keys and the names a config may use."""

"""What the server knows of its models: each one's info and manifest checks (info), the set it
serves (modelset), the repository it loads from (repository), the precision (precision) and the
device (device) each is served at."""

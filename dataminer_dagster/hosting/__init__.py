"""Where the pipeline runs besides `dagster dev`: in one foreground process with the sensors'
decisions (`driver`, behind `dataminer run`), under a private supervisord (`services`), and the
Dagster instance storage that dagster.yaml names (`instance_storage`: Dagster's tables in the
embedded or external PostgreSQL)."""

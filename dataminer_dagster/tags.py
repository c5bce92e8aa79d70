"""Every Dagster tag the pipeline writes or reads, in one place."""

# Op tags of the stage assets.
STAGE_TAG = "dataminer/stage"  # the work-item stage an asset processes
DEVICE_TAG = "dataminer/device"  # "gpu" on the model stages
CELERY_QUEUE_TAG = "dagster-celery/queue"  # the dagster-celery queue a step goes to
GPU_OP_TAGS = {DEVICE_TAG: "gpu", CELERY_QUEUE_TAG: "gpu"}  # the op tags of the model stages
GPU_POOL = (
    "gpu"  # the Dagster pool (concurrency key) the model stages take a slot of (dagster.yaml)
)

# Run tags of the runs the sensors and schedules request.
LANE_TAG = "dataminer/lane"  # the lane (job) of the run
STAGES_TAG = "dataminer/stages"  # the stages of the lane this run executes, comma-separated
ITEMS_TAG = "dataminer/items"  # how many work items the run was requested for
BATCH_TAG = "dataminer/item_id_range"  # "<first>-<last>" work item id of the request
PROJECT_NAMES_TAG = "dataminer/project"  # the projects the run works for, by name, for people
REQUESTED_BY_TAG = "dataminer/requested_by"  # one of AUTOMATIONS: the run respects retry back-off
AUTOMATIONS = ("sensor", "schedule")  # what requests runs without a person
AHEAD_TAG = "dataminer/ahead"  # "true": requested before its input was ready; it waits for it
# Runs of `dataminer run`:
PROJECTS_TAG = "dataminer/projects"  # ids, comma-separated: claim only items of these projects
DEADLINE_TAG = "dataminer/deadline"  # Unix time after which the run starts no new item
PRIORITY_TAG = "dagster/priority"  # the run queue starts higher values first

# Dagster's own tags: a run of a backfill, a run over a range of partitions.
BACKFILL_TAG = "dagster/backfill"
RANGE_START = "dagster/asset_partition_range_start"
RANGE_END = "dagster/asset_partition_range_end"

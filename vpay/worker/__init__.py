"""The worker process: claim loops in a thread pool, outcome writing, lease
renewal and reaping threads, signals and the drain, sd_notify and the
watchdog. It knows no job kind: the handlers are handed to it
(``loop.Dispatcher``)."""

"""Apache Spark, where the copies and comparisons run when they are big enough: which engine
a copy takes (`engine_choice`), the run's runner (`runner`) and its context (`session`), a
job over a list of tasks (`task_job`), Spark Connect (`connect_session`) and the warm local
server (`connect_server`), the local worker daemon (`worker_daemon`, named in a string), the
driver JVM's output and class archive (`jvm_output`, `jvm_archive`, `archive_build`,
`jvm_stop`), and the Python environment a cluster's executors get (`executor_env`).

May import: base, project, postgres, plan, transfer.
"""

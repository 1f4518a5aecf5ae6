"""A job as the user writes it: the job file and its flags, the help, ``[skrull]``, the config
that picks the trainer, and the checks made before any model is built."""

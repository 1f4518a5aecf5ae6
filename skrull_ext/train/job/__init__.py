"""A job as the user writes it: the job file and its flags, the help, the sections torchtitan's
config lacks (``[skrull]``, ``[loss]``, ``[validation]``, ``[comm]``), the config whose
``build()`` builds the trainer registered for it, and the checks made before any model is
built. It sits below the trainers in train/ and imports nothing of them (tests/unit_tests/test_package.py)."""

"""``python -m skrull_ext.data prepare`` moved to ``python -m skrull_ext.prepare``.

Building a store reads a whole job (the trainer's job file), which the data
room does not import; the command lives at the package root
(skrull_ext/prepare.py). This says so in one line, exit status 2, and
imports nothing.
"""

import sys

if __name__ == "__main__":
    args = " ".join(sys.argv[2:] if sys.argv[1:2] == ["prepare"] else sys.argv[1:])
    sys.stderr.write(f"error: the store is built by 'python -m skrull_ext.prepare{' ' + args if args else ''}' "
                     "(python -m skrull_ext.data prepare moved there)\n")
    sys.exit(2)

"""The lab's CLI commands (``avsg bench``, ``avsg trace``, ``avsg serve-sim``), registered in
``avsg.commands``' one table."""

"""Last-resort patches to torchtitan 0.3.0, one per file, where it has no
extension point (subclass, override registry, config hook). None yet."""

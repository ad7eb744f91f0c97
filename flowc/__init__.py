"""flowc: the compiler and runtime behind `flow`, and the `flowc` command.

Installed import names are `flow` (the OneFlow-style API users write against) and `flowc`.
The repository keeps the compiler, the runtime and the code templates in top-level folders;
inside this package they are `flowc.compiler`, `flowc.runtime` and `flowc.codegen_templates`
(links in the source tree, real folders in a wheel), so nothing else lands in site-packages.

Example:
    $ flowc compile examples/mlp_train_demo.py      # or: python -m flowc compile ...
"""
__version__ = "0.1.0"

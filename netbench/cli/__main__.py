"""`python -m netbench.cli`: the same as the `netbench` command."""

from netbench.cli.app import main

main()

from rlconf.cli import main

main()

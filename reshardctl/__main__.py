from reshardctl.cli import main

main()

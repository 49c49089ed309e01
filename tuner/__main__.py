from tuner.commands.cli import main

main()

from tuner.commands.entry import main

main()

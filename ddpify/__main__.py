from ddpify.cli import main

main()

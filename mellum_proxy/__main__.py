from mellum_proxy.cli import main

main()

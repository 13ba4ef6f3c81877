from tpuprof.cli import main

main()

from reasonray.evals.study import main

main()

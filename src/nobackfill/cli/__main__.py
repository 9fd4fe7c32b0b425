from . import main

if __name__ == "__main__":  # not when multiprocessing's spawn re-imports this module in a child
    main()

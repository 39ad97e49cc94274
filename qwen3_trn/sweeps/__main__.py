from qwen3_trn.sweeps.sweep import main

if __name__ == "__main__":
    main()

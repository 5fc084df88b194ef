def run(cfg):
    print(cfg)

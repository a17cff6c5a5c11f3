def main() -> None:
    print("running as", __name__)


if __name__ == "__main__":
    main()

from farm.cli.console import console

console()

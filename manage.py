#!/usr/bin/env python
import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gpuadmin.settings")
    if sys.argv[1:2] == ["demo_fleet"]:
        # Before the settings read GPUADMIN_DATA_DIR: the demo's own directory, var/demo/.
        from gpuadmin.demo.fleet_data_dir import NoDataDir, choose

        try:
            chosen = choose(os.environ)
        except NoDataDir as missing:
            sys.exit(str(missing))
        if chosen:
            print(chosen, file=sys.stderr)
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()

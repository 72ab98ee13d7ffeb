from ksearch_ray.cli import main

main()

module github.com/roce-emu/roce-emu

go 1.26.0

require github.com/stretchr/testify v1.12.1

require (
	github.com/google/gopacket v1.1.19 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
	golang.org/x/net v0.62.0 // indirect
	golang.org/x/sys v0.50.0 // indirect
)

package transport

import (
	"reflect"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/roce-emu/roce-emu/qp"
)

// Stats.Drops lists every drop cause, and nothing that is not one.
func TestStatsDrops(t *testing.T) {
	var s Stats
	v := reflect.ValueOf(&s).Elem()
	for i := range v.NumField() {
		v.Field(i).SetUint(uint64(i + 1))
	}
	var names []string
	for _, d := range s.Drops() {
		names = append(names, d.Name)
	}
	assert.Subset(t, names, []string{"rx_malformed", "rx_bad_icrc", "rx_unknown_qp", "rx_bad_source", "tx_errors", "tx_encode_errors"})
	assert.NotContains(t, names, "rx_datagrams")
	assert.NotContains(t, names, "tx_datagrams")
	assert.NotContains(t, names, "rx_cnps")
	assert.Equal(t, []qp.Count{{Name: "rx_bad_source", Value: 2}}, Stats{Received: 9, BadSource: 2}.Drops())
}
